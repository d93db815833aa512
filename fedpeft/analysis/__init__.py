"""What methods leave in a run directory, read back and drawn without torch: numpy, ``safetensors.numpy`` and
matplotlib only, so that ``fedpeft report`` never imports torch, peft or transformers.

- :mod:`.scales`: the clients' BayesTune rank scales (``bayestune_lora``, ``fedp2eft``): their files, the pruning
  of scales to a rank budget (the one definition, which :mod:`fedpeft.adapters.bayestune` calls at run time),
  rank structures and language distances; :mod:`.scale_plots` draws them;
- :mod:`.mixing`: the mixing weights of the merging methods (Potara, Fisher merging): their table and plot.

A method's reporting hooks that live here are named by its registry declaration
(``report_plots="fedpeft.analysis.scale_plots:rank_scale_plots"``, :mod:`fedpeft.catalog.methods`), and the report
calls them without importing the method (:mod:`fedpeft.report.method_hooks`). Nothing here imports a fedpeft
module outside :mod:`fedpeft.core`.
"""
