"""The child's training data, one module per step.

``load`` (records from a file, the hub or the shipped dataset), ``formats``
(a record as prompt and response), ``tokenize`` (token ids, loss masks,
truncation and packing), ``cache`` (prepared datasets kept per key),
``collate`` (batches that count their tokens); ``prepare`` strings them
together. Importing this package imports none of them.
"""
