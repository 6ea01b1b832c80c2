"""The parallel plan's run on workers, in one room: the pool from ComfyUI's side and its stand-in in ComfyUI's
model management (pool), the Ray driver in a process of its own (driver), the Ray actor that is one worker
(actor), what a worker does with a run (worker) and the Ulysses split of ComfyUI's WanModel that each worker runs
(sequence). The plan's pure rules are in core/parallel.py, its node in parallel_nodes.py.

Nothing here is imported by the one-process engine (engine.py): the sampler node chooses between engine.sample
and pool.sample_on_workers, and a worker runs engine.sample itself."""
