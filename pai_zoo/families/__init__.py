"""L2, families: what a family is (:mod:`.family`), the registry that discovers plugins through their entry points
(:mod:`.registry`), and the core's own hook implementations (:mod:`.defaults`)."""
