"""``python -m tools.api ...``: the same command as ``tools api`` (for containers and
``tools.api.server.ApiServer``)."""

from tools.api.command import api

if __name__ == "__main__":
    api(prog_name="python -m tools.api")
