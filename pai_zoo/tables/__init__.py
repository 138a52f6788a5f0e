"""L1, weight tables: the declarative row kinds and the engine that runs a family's table both ways (:mod:`.mapping`),
the rows and rules shared by Llama-layout families (:mod:`.layouts`), and the names of routed experts."""
