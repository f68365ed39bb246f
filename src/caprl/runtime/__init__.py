"""Local-run plumbing shared by the pipeline's helpers: a small Unix-socket server
(``socket_service``) and the ``caprl`` command's client of the job server (``job_client``)."""
