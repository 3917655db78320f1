"""otfed's federated protocols as Flower apps, over a real transport (Flower's Deployment Engine).

:mod:`~otfed.flower.records` (typed messages on the wire and the check of every received message — no ``flwr``
needed), :mod:`~otfed.flower.transport` (to and from Flower's ``RecordDict``), :mod:`~otfed.flower.workers`
(:class:`~otfed.federation.parties.Workers` whose parties live on SuperNodes), :mod:`~otfed.flower.fedbary`
and :mod:`~otfed.flower.fedwad` (each protocol's calls over Flower: the client node's side and the ServerApp's
session), :mod:`~otfed.flower.node` (a client node's dispatch and private state), and, in the pipeline's operations (processes are
the pipeline's to start and stop), ``flows/flower_federation.py`` (a local SuperLink and SuperNodes) and
``flows/flower_check.py`` (Flower vs in process, bit for bit).
The ServerApp and ClientApp objects are in ``otfed/flower/app/``, the Flower app ``flwr run`` submits. Modules
that use ``flwr`` import it when called: it lives in its own environment (``.venv-flower``, ``make
flower-setup``), apart from the pipeline's.
"""
