"""The `t5lite` command: flag parsing (main), what each verb does (commands), listings,
quickstart."""
