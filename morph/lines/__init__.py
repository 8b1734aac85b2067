"""What a render is made of: voices, reference audio, text segments, the script reader, and the line store
that keeps each finished line on disk with the manifest a resumed run reads."""
