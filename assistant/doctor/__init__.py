"""``manage.py ttft_doctor``: probe each layer between the workers and a student (``client``),
judge what the probes saw (``checks``), and report it (``run``)."""
