"""Words that match their number in what the bundle prints."""


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """`number` and `noun`, plural unless it is one: "1 organisation", "2 organisations".

    Args:
      number: how many.
      noun: the noun in the singular.
      plural: its plural, where adding "s" is wrong.
    """
    return f"{number} {noun_for(number, noun, plural)}"


def noun_for(number: int, noun: str, plural: str | None = None) -> str:
    """`noun` for `number` of it, as `counted` words it, without the number ("runs 1, 2")."""
    return noun if number == 1 else plural or noun + "s"
