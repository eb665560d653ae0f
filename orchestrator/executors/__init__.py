"""Where experiments run: one executor per module (or package), ``local`` and ``packed`` among them.

``base`` holds the protocol every executor implements and the ``RunContext``
it runs with; ``registry`` maps names to executors; ``scheduler`` is the pure
packing logic.
"""
