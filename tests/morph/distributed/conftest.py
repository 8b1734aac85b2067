from .own_ray import own_ray  # noqa: F401 (the fixture, for every test here)
