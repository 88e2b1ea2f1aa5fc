"""The torch-free core that the API (`app`) and the engine (`workers`) share.

`app -> core <- workers`: settings, the store (engine, tables, migrations), the job lifecycle, job
request specs, the method and family registries, the prediction laws. Nothing here imports torch
or either side; docs/architecture.md shows the whole layout.
"""
