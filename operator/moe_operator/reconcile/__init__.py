"""The reconciler's decisions, pure: data from the indexes in, what to write out.

``observe`` turns index contents into planner and lifecycle inputs; ``backend`` chooses what
runs the instances; ``children`` diffs desired against observed children; ``groups`` turns
lifecycle decisions into group actions; ``status`` computes the status to write. The kopf
shell (moe_operator.handlers.reconcile) reads, calls these in named steps, and writes.
"""
