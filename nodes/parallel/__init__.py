"""The parallel plan's run on workers, in one package, one job a module, each importing only those before it:

- gate: whether Ray and yunchang can be imported (the refusal that says how to install them);
- auth: Ray's token authentication, checked by the pool, the driver and the actor;
- actor: the Ray actor that is one worker (a process of its own, sent there by value);
- driver: the Ray driver, a process of its own that starts the workers and relays runs;
- rebuild: what a MODEL sends a worker, and the clone the worker makes of it;
- sequence: the Ulysses and CFG splits of ComfyUI's WanModel that each worker runs;
- worker: what a worker does with a run (engine.sample on its share);
- launch: what the driver is told to start the workers with (devices, ComfyUI's folder and options, the pack);
- pool: the link from ComfyUI's process to the driver (start, relay a run, stop);
- registry: the warm pool, its stand-in in ComfyUI's model management, and its release;
- sampling: one run on the workers, refused before any starts where a worker could not rebuild it.

The plan's pure rules are in core/parallel.py, its node in parallel_nodes.py. Nothing here is imported by the
one-process engine (engine.py): dispatch.py chooses between engine.sample and sampling.sample_on_workers, and a
worker runs engine.sample itself."""
