"""From training nodes to mini-batches: sharding, the neighbour sampler, loaders, GPU feature
cache and the prefetch thread."""
