"""The models a child trains: hub ids and local folders, architectures, the tiny model.

``README.md`` beside this file lists the kinds of model name and what to touch to add one.
"""
