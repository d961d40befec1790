"""The desk's background jobs, one file each as RQ's idiom has it: plain functions the queue names by
their dotted path (webapp/runtime/queue.py), so nothing in webapp imports them. Each takes ids, calls
the desk's rules (webapp/agent, webapp/notify/, ...), commits, and only then enqueues what follows."""
