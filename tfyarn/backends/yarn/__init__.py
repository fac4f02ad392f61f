"""The YARN backend over skein: ``backend.YarnBackend``, one class made of one part per job (``connection``,
``submit``, ``status``, ``logs``, ``reports``, ``end``), with the app's records (``records``), YARN's states
(``states``), the ApplicationSpec (``appspec``), the RM's REST API (``rest``, ``cluster_info``), log files
(``log_files``), the job's timeline (``phases``), the detached report (``detached_report``), the shared skein driver
(``driver``, ``driver_keeper``) and the supervisor inside every application (``supervise``)."""
