"""The child's training data, one module per step.

``sources`` (records from a file, the hub or the shipped dataset), ``formats``
(a record as prompt and response), ``tokenize`` (token ids, loss masks,
truncation and packing), ``cache`` (prepared datasets kept per key),
``collate`` (batches that count their tokens), ``holdout`` (the held-out
part for eval), ``images`` (the shipped image set); ``prepare`` strings them
together. Importing this package imports none of them.
"""
