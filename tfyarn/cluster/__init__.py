"""Access to the cluster (HDFS, Kerberos, SPNEGO, skein), used by the gateway and by tasks."""
