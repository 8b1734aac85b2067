"""What a render is made of: voices, reference audio, text segments, the script reader, and the line store."""
