"""The `layergrad` TensorBoard plugin: HTTP routes and static files for the tab.

TensorBoard imports `tb_layergrad.plugin.loader` through the
`tensorboard_plugins` entry point while it starts, and an ImportError there
stops TensorBoard. So nothing in this package imports TensorFlow or anything
heavy: only `tb_layergrad.metadata`, `tb_layergrad.reader` (which reads the
series), TensorBoard itself, werkzeug and numpy. This `__init__` imports
nothing at all, so importing the loader stays cheap.

Modules, one job each (the reading itself is `tb_layergrad.reader`'s):
  loader     -- the entry point: flag fixing (keep every step), plugin creation
  flags      -- the plugin's own flags (`--layergrad_prefetch`)
  plugin     -- the TBPlugin: name, tab, route table
  prefetch   -- reading the runs' statistics ahead of the tab, in the background
  routes     -- the route table: each route parses its query, calls an `*_impl`, responds (docs/HTTP_API.md)
  queries    -- each route's query, validated whole (400s)
  reading    -- the provider, lister and caches the routes share, and the lookups of names (404s)
  layer_impl -- the answers of the one-layer routes
  run_impl   -- the answers of the routes over a run's layers or several runs
  bodies     -- the JSON of the `runs` and `anomalies` routes, from the reader's results
  example_bodies -- the JSON of the `examples` and `noise_scale` routes (per-example records)
  listing    -- `list_tensors` without walking every stored record again (Python loader)
  params     -- one query value's validation (400s)
  responses  -- strict JSON/CSV bodies and the JSON error wrapper
  static     -- serving the `frontend/` folder safely
"""
