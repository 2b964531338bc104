"""The `layergrad` TensorBoard plugin: HTTP routes and static files for the tab.

TensorBoard imports `tb_layergrad.plugin.loader` through the
`tensorboard_plugins` entry point while it starts, and an ImportError there
stops TensorBoard. So nothing in this package imports TensorFlow or anything
heavy: only `tb_layergrad.metadata`, TensorBoard itself, werkzeug and numpy.
This `__init__` imports nothing at all, so importing the loader stays cheap.

Modules, one job each:
  loader     -- the entry point: flag fixing (keep every step), plugin creation
  plugin     -- the TBPlugin: name, tab, route table
  routes     -- one handler per JSON route (docs/HTTP_API.md)
  catalog    -- which series exist (metadata only, no tensor bodies)
  series     -- reading tensors for a run/tag set, step selection, statistics
  params     -- query-string validation (400s)
  responses  -- strict JSON/CSV bodies and the JSON error wrapper
  static     -- serving the `frontend/` folder safely
"""
