"""The GPU runs of the project (a CUDA check, the paper-scale text track, scale-out with 16 cores, a Prefect GPU
worker) on a remote CUDA host without a package index, and the offline wheel kit that makes them possible.

* ``gpu_session.sh`` — the phases one session runs on the GPU node (``bash gpu/gpu_session.sh PHASE``:
  ``check``, ``scale``, ``paper-start``, ``worker-start``, ``wait``, ``collect``), the long runs in the background;
* ``gpu_check.sh`` — the GPU check (``make gpu-check``): the machine, the ``gpu``-marked tests and a timed tiny
  text-track run on CUDA and on the CPU;
* ``gpu_worker_job.sh`` — prefect.yaml's GPU deployment end to end (what ``gpu_session.sh worker-start`` runs);
* ``device_kit.py`` — builds the kit (``python -m gpu.device_kit``, ``make device-kit``): the Python packages
  otfed needs that such a node lacks, packed to travel with the checkout; ``device_packages.txt`` lists what the
  nodes already have.

The benchmarks these sessions run stay in ``bench/``; research studies are in ``studies/``.
"""
