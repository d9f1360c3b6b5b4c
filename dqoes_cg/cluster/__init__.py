"""The cluster side of dqoes-cg on Docker Swarm: the manager (`dqoes-manager`, on Swarm
managers), the agent beside dqoesd on every node (`dqoes-agent`), the channel between them,
the cluster view that `dqoesctl cluster status` shows and placement reads (view.py), and
the placement policy that the manager carries out (placement.py, qoe_placement.py).
"""
