"""The competition: an entry's runs packed into one signed file, checked, reproduced and imported
by an organiser, and one leaderboard from many machines.

A submission package (format 1) is a deterministic gzip'd tar under one folder `d500-package/`:
a manifest with the sha256 of every member, an optional ed25519 signature over the manifest, every
ledger run of the entry exactly as the origin ledger sealed it (so its seal and row hash can be
recomputed without that database), the ledger's chain skeleton, the studies, the environments'
provenance, each run's MLLOG file, the submission's files and the workload files the runs recorded.

The package, one job per module:
    layout       the format: member names, which names are safe, one exported run as read
    package      the reader everyone uses: Package.open(path) -> members, runs, integrity checks
    export       the builder: build(submission_dir, out, ledger, sign_key=None) -> Path
    signing      ed25519 keys, signing and verifying the manifest (the `cryptography` library)
    check        the package checker (completeness, rules, integrity, logs, convergence)
    completeness the seeds and studies a workload requires, distinct seeds, gapless studies
    compliance   MLPerf's compliance checker (mlperf_logging) run on one d500 MLLOG
    consistency  each run's record (figures, evaluations, status, times) against its own MLLOG
                 (consistency_training: the evaluations and times of level-2/3 runs)
    convergence  reference convergence: epochs-to-target tested against the workload's samples
    reference    measuring a workload's reference convergence (the organiser's runs)
    reproduce    re-running chosen runs of a package on this machine and comparing them
                 (reproduce_prepare: the recipe rebuilt; reproduce_job: one re-run in its own
                 process; reproduce_compare: what must agree; reproduce_level0: level 0)

Its commands (each a module with `main(argv, prog)`, registered in d500.cli.CORE):
    d500 package SUBMISSION_DIR --out FILE [--ledger PATH] [--sign KEYFILE]   (package_cli)
    d500 keygen KEYFILE          ed25519 private key (PEM, mode 0600), KEYFILE.pub  (keygen_cli)
    d500 check PACKAGE [--rules DIR] [--trust PUBKEY ...] [--json]             (check_cli)
    d500 reference WORKLOAD [--entry NAME] [--runs N]                          (reference_cli)
    d500 reproduce PACKAGE [--runs K] [--seed S] [--ledger PATH]               (reproduce_cli)
    d500 ledger import PACKAGE [--force] [--rules DIR]      (d500.ledger_cli, d500.ledger.imports)
"""
