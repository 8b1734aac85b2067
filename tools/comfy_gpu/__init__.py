"""The steps of tools/comfy_gpu_run.py (a real ComfyUI run of the pack, measured through its HTTP API):
install.py installs the pack and stages checkpoints and clips, server.py starts and talks to ComfyUI,
runs.py queues the runs, report.py judges and summarises them."""
