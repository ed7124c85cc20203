"""The dataset error every data-reading module raises (its own module, so readers import it one way)."""


class DatasetError(ValueError):
    """A dataset-level problem (bad folder, split or configuration)."""
