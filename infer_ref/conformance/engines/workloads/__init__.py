"""What the engine tier sends: the prompts and requests of the default workload (``prompts``) and the
long-context one (``long``), the kit's engine checkpoints they run on (``checkpoints``,
``long_checkpoints``, ``folders``), each workload's start geometry (``geometry``), and prompts drawn
text-stable for engines of text prompts (``text_stable``)."""
