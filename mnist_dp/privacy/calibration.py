"""σ for a target ε: the searches over a function ε(σ) that falls as σ grows, on a grid of σ.

The accountant (accountant.py) and the search's (search_accountant.py) give the ε functions; here is
only how σ is searched, so that the σ returned had its own ε computed and meets the target.
"""
from __future__ import annotations

import math

import scipy

FIRST_LOWER_END = 0.9  # of the RDP-calibrated σ: where calibrate's bracket for PLD starts


def calibrate(pld_epsilon, rdp_epsilon, target_epsilon: float, tol: float, least: float,
              most: float) -> float:
    """The least σ on the grid of `tol` in [least, most] whose `pld_epsilon` meets the target (PLD
    meets it at `most`: accountant.noise_range checked it); `least` rounded up to the grid when it
    meets it.

    PLD is slow for small σ, so it is bracketed with RDP first: RDP over-estimates ε, hence the
    RDP-calibrated σ is an upper end for PLD. PLD's σ is usually within a few per cent of it, so
    the lower end is tried there first, then halved (PLD at half the σ is the slowest figure); only
    the search's speed depends on it.
    """
    if rdp_epsilon(least) <= target_epsilon and pld_epsilon(least) <= target_epsilon:
        return round(math.ceil(least / tol) * tol, 6)
    # where only PLD's figure meets the target below the ceiling (the count's noise comes close)
    upper = most
    if rdp_epsilon(most) <= target_epsilon:
        upper = min(most, root(rdp_epsilon, target_epsilon, least, most, tol) + tol)
    lower = max(upper * FIRST_LOWER_END, least)
    while pld_epsilon(lower) <= target_epsilon:
        if lower == least:
            return round(math.ceil(least / tol) * tol, 6)
        upper, lower = lower, max(lower / 2, least)
    return least_on_grid(pld_epsilon, target_epsilon, lower, upper, tol, most)


def least_on_grid(epsilon, target_epsilon: float, lower: float, upper: float, tol: float,
                  most: float) -> float:
    """The least multiple of `tol` above `lower` whose `epsilon` meets the target (at most `most`),
    where ε(lower) does not, ε(upper) does and ε falls as σ grows: regula falsi (Illinois) on the
    grid's indices, interpolating in 1/σ² (a Gaussian's privacy loss goes as 1/σ², and the secant
    lands closer). The σ returned had its own ε computed, and the grid point below it missed the
    target or lies below a σ that did (`lower`): no rounding is checked afterwards, and fewer PLD
    figures are computed than by Brent's method (docs/design.md)."""
    def gap(k: int) -> float:  # k: a grid index, σ = k · tol as returned
        return epsilon(round(k * tol, 6)) - target_epsilon

    # a real index at first; above the target there
    low, f_low = lower / tol, epsilon(lower) - target_epsilon
    # a rounded-up σ's PLD figure may miss, by a hair
    upper = rounded_up(epsilon, upper, target_epsilon, tol, most)
    if upper == round(most, 6):
        return upper
    high = round(upper / tol)
    f_high = gap(high)  # remembered by `epsilon`, as every figure a calibration asks again
    moved = None
    while high - math.floor(low) > 1:  # a grid point lies strictly between the ends
        a, b = low ** -2, high ** -2
        # the secant's root, back from 1/k²
        guess = (b - f_high * (b - a) / (f_high - f_low)) ** -0.5
        k = min(max(math.ceil(guess - 1e-9), math.floor(low) + 1), high - 1)
        f = gap(k)
        if f <= 0:
            # Illinois: an end kept twice has its gap halved, or it would be kept forever
            if moved == "high":
                f_low /= 2
            high, f_high, moved = k, f, "high"
        else:
            if moved == "low":
                f_high /= 2
            low, f_low, moved = k, f, "low"
    return round(high * tol, 6)


def rounded_up(epsilon, sigma: float, target_epsilon: float, tol: float, most: float) -> float:
    """`sigma` (a root found within `tol` on either side, or an upper end) rounded up to the grid of
    `tol` and stepped up a grid point at a time until `epsilon` meets the target at the σ returned
    (at `most` it does)."""
    k = math.ceil(sigma / tol - 1e-9)
    while k * tol < most and epsilon(round(k * tol, 6)) > target_epsilon:
        k += 1
    return round(min(k * tol, most), 6)


def root(epsilon, target_epsilon: float, lower: float, upper: float, tol: float) -> float:
    """σ in [lower, upper] where `epsilon` meets the target, within `tol` on the side where it
    holds: the search of dp_accounting.calibrate_dp_mechanism over an explicit bracket (Brent's
    method), on an `epsilon` that remembers its figures."""
    def gap(sigma: float) -> float:
        return epsilon(sigma) - target_epsilon

    root, result = scipy.optimize.brentq(gap, lower, upper, xtol=tol, full_output=True)
    if not result.converged:
        raise ArithmeticError(f"Brent's method did not converge in [{lower}, {upper}]")
    if gap(root) > 0:
        if gap(root + tol) < 0:
            root += tol
        elif gap(root - tol) < 0:
            root -= tol
        else:
            raise ArithmeticError(f"no σ within {tol} of {root} meets the target")
    return root
