"""The worker's exactly-once path: the ports it needs (``ports``), the pure steps of a batch
(``plan``), the commit order that carries them out (``pipeline``), the scheduling across
partitions (``dispatcher``), dead-letter records (``dead_letter``) and a batch's metrics and
log lines (``reporting``). Imports the domain and the ports, never an adapter."""
