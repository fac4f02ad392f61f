"""The YARN backend over skein (``backend``): the ApplicationSpec (``yarn_spec``), status (``yarn_status``,
``yarn_rest``), logs (``yarn_logs``), the job's timeline (``phases``), the detached report
(``yarn_report``), the shared skein driver (``yarn_driver``) and the supervisor inside every application
(``yarn_supervise``)."""
