"""Small leaves with no other home, each importing nothing of disque_py: Redis's glob patterns
(``globmatch``), a process's RSS (``rss``), and the optional extras and what each lacks
(``extras``)."""
