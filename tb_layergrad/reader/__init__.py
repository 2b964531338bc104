"""Reading what tb_layergrad wrote: the plugin, `tb-layergrad report` and `tb_layergrad.load()` read here.

No TensorFlow and nothing of the HTTP server: only `tb_layergrad.metadata` (the on-disk contract),
TensorBoard's data providers and event readers, and numpy (pandas for `load()` alone). So the same
numbers reach the tab, the terminal and a notebook. This `__init__` imports nothing.

Modules, one job each:
  catalog        -- which series exist (metadata only, no tensor bodies); unknown names are 404s here
  series         -- reading tensors of a run/tag set, step selection, stored and derived statistics
  stats_store    -- stats series kept as tables while TensorBoard reports them unchanged
  run_source     -- one run to read: provider, request context, experiment, catalog, caches
  layer_points   -- a layer's points of any kind, whatever format version wrote them (every reader reads here)
  examples       -- per-example records (kind `examples`) as tables, and their bins
  anomalies      -- the anomaly rules of docs/ANOMALIES.md, pure numpy
  dominance      -- the rule of one example dominating a layer (its names also in `anomalies`)
  trends         -- a layer's trend over steps and decay through time (its names also in `anomalies`)
  verdict        -- one state per layer and one line per finding: what every reader shows
  origin         -- where a run first went non-finite for a target (`tb_layergrad.nonfinite_origin`'s rule)
  run_anomalies  -- what the rules need for one run, read through a data provider, then the rules
  event_files    -- TensorBoard's event-file reader over a logdir, without importing TensorFlow
  hparams        -- each run's hyperparameters as logged with TensorBoard's HParams API (nearest session)
  run_health     -- one run's gradient health in a row (the `sweep` route), kept while its listing is the same
  noise_scale    -- the gradient noise scale at the end of a run, smoothed as the tab draws it
  dataframe      -- `tb_layergrad.load(logdir)`: every statistic as a pandas DataFrame
"""
