"""Managed API keys, tenants and spend budgets (issue 25).

The mechanism lives here: key records (:mod:`.records`), the admin API's input
rules (:mod:`.fields`), budget periods (:mod:`.periods`), the spend ledger kept in
this process or in Redis (:mod:`.ledger`), the registry that persists keys in the
store and shares them with other gateway replicas through Redis (:mod:`.registry`)
and the admission check (:mod:`.guard`). The ``key_budgets`` plugin
(``tokenops_plugins.compute_network.key_budgets``) decides to enforce it.
"""
