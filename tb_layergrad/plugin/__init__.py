"""The `layergrad` TensorBoard plugin: the HTTP routes (docs/HTTP_API.md) and the tab's static files.

No TensorFlow here: TensorBoard imports `loader` at start, where a slow or failing import slows or stops it.
"""
