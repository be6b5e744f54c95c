"""Stage 8: the report -- text, JSON and JUnit (``report``) -- and several reports as one
published table (``results_table``).
"""
