"""The names of what the studies write, each defined once (a run directory's own files are in roformer.train.run_dir).

    roformer compare --out DIR:         summary.md, summary.json, curves.png, length.png (when lengths were measured)
    roformer glue --output-dir DIR:     results.md (next to run_dir.RESULTS_FILE, run_dir.SUBMISSION_DIR and the
                                        suite's own run_dir.RUN_CONFIG_FILE: its tasks and overrides)
    roformer experiment --output-dir:   <arm>-seed<k>/ (experiment.arm_run_path), glue/<arm>-seed<k>/<task>/,
                                        compare/ (the files of roformer compare), report.md
    roformer eval-mlm:                  run_dir.LENGTH_FILE next to a run's final/

Imports nothing, so the CLI and the torch-free reporting modules can name these files cheaply.
"""

SUMMARY_MARKDOWN_FILE = "summary.md"  # compare: the tables (roformer.study.markdown.summary_markdown)
SUMMARY_JSON_FILE = "summary.json"  # compare: the numbers (roformer.study.compare.summarise)
CURVES_PLOT_FILE = "curves.png"  # compare: loss curves with seed bands
LENGTH_PLOT_FILE = "length.png"  # compare: eval loss against length
PROBE_PLOT_FILE = "probes.png"  # compare: probe accuracy against length, with interval bands
SUITE_TABLE_FILE = "results.md"  # glue: one row per task and metric (roformer.study.markdown.glue_suite_table)
COMPARE_DIR = "compare"  # experiment: the output of roformer compare over every run
GLUE_DIR = "glue"  # experiment: <out>/glue/<arm>-seed<k>/<task>/, the GLUE stage's fine-tuning runs
REPORT_FILE = "report.md"  # experiment: the comparison and how to reproduce it (roformer.study.report)
