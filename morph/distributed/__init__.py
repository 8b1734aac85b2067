"""A script over many GPUs and machines with Ray, which is optional: nothing here is imported otherwise."""
