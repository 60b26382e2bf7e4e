"""What a recording says about memory: which call produced the bytes each call read, and calls
on different streams that touch the same bytes with nothing ordering them (`replay graph`)."""
