"""TEMPORARY placeholder: a helper is writing this reader now."""
FORMAT = "rocpd"
DESCRIPTION = "rocpd"


def sniff(path, head):
    return False


def read(path, *, rank, cache_dir):
    raise NotImplementedError
