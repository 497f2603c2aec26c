"""Training and fine-tuning: the clip forward, ground truth, losses, data and the loop.

Import the modules themselves (``mapstream.train.losses``, ``mapstream.train.normalize``, ...);
this package file imports none of them, so that importing one part never pulls in the rest
(the loop's optimiser, the data's renderers).
"""
