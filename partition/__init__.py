"""The offline partition tool (installed as ``distgnn.partition``).

Imports only numpy, pymetis, the on-disk format module and the partition book;
never the runtime's server or rpc code.
"""
