"""Studies built from training runs: experiments (arms x seeds), GLUE suites, length evaluation and comparisons.

The computing modules (compare, stats, suite, length_eval) return data; `markdown` renders every table of it and
`outputs` names every file the studies write. `compare`, `markdown` and `outputs` import no torch.
"""
