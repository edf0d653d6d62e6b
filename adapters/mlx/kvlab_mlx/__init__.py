"""kvlab_mlx: recompute kvlab vectors files with real MLX and mlx-lm (see ../README.md)."""
