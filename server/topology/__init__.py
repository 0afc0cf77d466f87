"""Process topology: fronts over one engine process (``--workers``, ``--engine-process``), the supervisor
that keeps them running, and children that never outlive the server."""
