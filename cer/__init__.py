"""CER: the shared meaning of compeer.

Every package imports the dialogue types, the 3-step reasoning format, the strategy taxonomy, the judge
verdict labels, the reward rules and the redundancy maths from here; nothing defines them twice.
"""
