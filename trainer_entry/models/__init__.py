"""The models a child trains: names on the hub, shipped architectures, user code, the tiny model."""
