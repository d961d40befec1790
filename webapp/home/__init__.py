"""The home page (one part per role, reading several features' actions) and the main navigation across the
features: the top of the house, beside the command line."""
