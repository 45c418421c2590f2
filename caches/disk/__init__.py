"""The disk tier: states in diskcache rows with a header and checksum (`format`), its token index (`index`,
`mirror`), the row store (`store`), the byte accounting (`usage`) and the tier itself (`tier`)."""
