//! Just enough JSON writing for flight records: objects of numbers, strings,
//! nulls, arrays and objects. (The library links no JSON crate: its C and Rust
//! users turn the command line's dependencies off.)

use std::fmt::Write;

/// An object being written.
pub(super) struct Json {
    text: String,
    first: bool,
}

/// A value a field can hold.
pub(super) trait Value {
    fn write(&self, out: &mut String);
}

impl Json {
    pub(super) fn object() -> Json {
        Json { text: String::from("{"), first: true }
    }

    pub(super) fn field(&mut self, name: &str, value: impl Value) -> &mut Json {
        if !self.first {
            self.text.push(',');
        }
        self.first = false;
        string(name, &mut self.text);
        self.text.push(':');
        value.write(&mut self.text);
        self
    }

    pub(super) fn finish(mut self) -> String {
        self.text.push('}');
        self.text
    }
}

/// `s` as a JSON string (quoted, escaped) at the end of `out`.
pub(super) fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

impl Value for u64 {
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl Value for usize {
    fn write(&self, out: &mut String) {
        let _ = write!(out, "{self}");
    }
}

impl Value for f64 {
    fn write(&self, out: &mut String) {
        if self.is_finite() {
            let _ = write!(out, "{self:.3}");
        } else {
            out.push_str("null");
        }
    }
}

impl Value for &str {
    fn write(&self, out: &mut String) {
        string(self, out);
    }
}

impl<T: Value> Value for Option<T> {
    fn write(&self, out: &mut String) {
        match self {
            Some(v) => v.write(out),
            None => out.push_str("null"),
        }
    }
}

impl Value for &[usize] {
    fn write(&self, out: &mut String) {
        out.push('[');
        for (i, v) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            v.write(out);
        }
        out.push(']');
    }
}

impl Value for &[Vec<usize>] {
    fn write(&self, out: &mut String) {
        out.push('[');
        for (i, v) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            v.as_slice().write(out);
        }
        out.push(']');
    }
}

impl Value for Json {
    fn write(&self, out: &mut String) {
        out.push_str(&self.text);
        out.push('}');
    }
}

impl Value for Vec<Json> {
    fn write(&self, out: &mut String) {
        out.push('[');
        for (i, v) in self.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            v.write(out);
        }
        out.push(']');
    }
}
