HELP = "turn `conform --json` reports of several kernels into one table (op x kernel: verdict, diagnosis)"


def add_arguments(p):
    p.add_argument("reports", nargs="+", metavar="REPORT.json", help="reports written by `refreplay conform --json`")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="a Markdown table (the default)")
    fmt.add_argument("--html", action="store_true", help="a self-contained HTML page")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of standard output")


def run(args) -> int:
    from ..conformance.reporting import results_table

    results = results_table.combine(args.reports)
    text = results_table.html_page(results) if args.html else results_table.markdown(results)
    if args.output:
        from .. import files

        files.write_atomic(args.output, text)  # synced temporary, renamed; errors are exit 2
    else:
        print(text, end="")
    return 0
