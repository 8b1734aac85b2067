"""A script over many GPUs and machines: Ray actors, one per GPU, each running the one-GPU scheduler (worker.py)
on batches that one driver plans and hands out (job.py). Ray is optional: nothing here is imported otherwise."""
