"""Reading what tb_layergrad wrote, for the plugin, `tb-layergrad report` and `tb_layergrad.load()`.

No TensorFlow and nothing of the HTTP server, so the same numbers reach the tab, the terminal and a notebook.
"""
