"""Secrets: what the desk keeps sealed (a Fernet key per purpose from SECRET_KEY), and the secrets of
its environment the operator granted to each tenant."""
