//! How both binaries print a fatal error: the message and its causes, each cause once.

use std::error::Error;

/// `e` and its causes joined with `: `. A cause whose text the message above already ends with
/// is left out: our error enums put their source in their own message (`cannot listen on X:
/// Address in use`), and printing the chain as well would say it twice.
pub fn error_chain(e: &(dyn Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut above = out.clone();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !above.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        above = text;
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrap(&'static str, Option<Box<dyn Error + 'static>>);
    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref()
        }
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = Wrap("No such file (os error 2)", None);
        let embedded = Wrap(
            "reading font /x: No such file (os error 2)",
            Some(Box::new(io)),
        );
        assert_eq!(
            error_chain(&embedded),
            "reading font /x: No such file (os error 2)"
        );
        let context = Wrap("starting bcctl serve", Some(Box::new(embedded)));
        assert_eq!(
            error_chain(&context),
            "starting bcctl serve: reading font /x: No such file (os error 2)"
        );
    }
}
