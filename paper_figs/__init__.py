"""Paper figures, one script per figure, each regenerated from simulator outputs.

Every ``figN_*.py`` has ``main(out_dir, quick=False) -> list[Path]`` writing a
PNG and an SVG, and runs on its own (``python paper_figs/fig1_role_timeline.py
DIR [--quick]``). Each also has ``figure_data(quick=False)``, a pure function
computing exactly what the figure plots, and ``main`` draws that result and
nothing else (figures 1-6 through ``draw(data) -> Figure``, figure 7 through
the shared prefix-graph renderer), so tests check the plotted data and read
the drawn Figure back. ``make_all.py`` runs them all (``gyre figs --out DIR``).
Figure 7 draws the trajectory-tree prefix graph of one execution shaped like docs/trajectories.md#trajectory-trees.
``cli`` is ``gyre figs``. May import: ``gyre``, ``gyre.sim``, ``gyre.analysis``.
"""
