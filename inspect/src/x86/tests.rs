//! The evaluator's bounds, on machine code built to break them: values mixed with
//! themselves (each step doubles a value's tree), many paths meeting, many stack slots.

use std::process::Command;

use super::*;
use crate::symbolic::expr;

/// An executable whose function `f` is `body` (GNU assembler, AT&T syntax), built with
/// gcc, with an unwind entry so that the evaluator finds its end.
fn built(tag: &str, body: &str) -> Option<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!("lrec-x86-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("f.c");
    std::fs::write(
        &src,
        format!(
            "__asm__(\".text\\n.globl f\\n.type f,@function\\nf:\\n.cfi_startproc\\n{body}\\n\
             ret\\n.cfi_endproc\\n.size f, .-f\\n\");\nlong f(long, long);\n\
             int main(int c, char **v) {{ return (int)f(c, (long)v); }}\n"
        ),
    )
    .unwrap();
    let exe = dir.join("f");
    let ok = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .ok()?;
    let data = ok.success().then(|| std::fs::read(&exe).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    data
}

fn run(tag: &str, body: &str) -> Option<(Vec<Event>, std::time::Duration)> {
    let Some(data) = built(tag, body) else {
        eprintln!("SKIPPED: gcc is not available");
        return None;
    };
    let code = Code::new(&data).unwrap();
    let (start, _) = code.symbol("f").unwrap();
    let t = std::time::Instant::now();
    let events = evaluate(&code, start, &[], Options::default());
    Some((events, t.elapsed()))
}

/// Every value an event holds, and the most nodes one has.
fn largest(events: &[Event]) -> usize {
    let values = events.iter().flat_map(|e| -> Vec<&Expr> {
        match e {
            Event::Load { addr, .. } => vec![addr],
            Event::Store { addr, value, .. } => vec![addr, value],
            Event::Compare { a, b, .. } => vec![a, b],
            Event::Call { args, .. } | Event::Jump { args, .. } => args.iter().collect(),
            Event::Return { value, .. } => vec![value],
        }
    });
    values.map(Expr::nodes).max().unwrap_or(0)
}

#[test]
fn a_value_mixed_with_itself_stays_bounded() {
    // rax = rdi; 300 times rax = (rax << 5) + rax ^ rax >> 2: as trees, 2^300 nodes.
    let step = "mov %rax, %rcx\\nshl $5, %rcx\\nmov %rax, %rdx\\nshr $2, %rdx\\n\
                add %rcx, %rdx\\nxor %rdx, %rax\\nmov %rax, (%rsi)\\n";
    let body = format!("mov %rdi, %rax\\n{}", step.repeat(300));
    let Some((events, took)) = run("mix", &body) else {
        return;
    };
    assert!(largest(&events) <= expr::MAX_NODES, "{}", largest(&events));
    // The first steps are still told: the store of step 1 is a function of rdi.
    let first = events.iter().find_map(|e| match e {
        Event::Store { value, .. } => Some(value.clone()),
        _ => None,
    });
    assert!(first.is_some_and(|v| v.contains(&Expr::Arg(0))));
    // Well under a second (it never ended before the bound).
    assert!(took.as_secs() < 10, "{took:?}");
}

#[test]
fn many_paths_meeting_stay_bounded() {
    // 200 diamonds, each merging two values of rax built from the last.
    let step = "test %rsi, %rsi\\nje 1f\\nlea 8(%rax,%rax,2), %rax\\njmp 2f\\n1:\\n\
                lea 16(%rax,%rax,4), %rax\\n2:\\npush %rax\\nmov (%rax), %rbx\\n";
    let body = format!("mov %rdi, %rax\\n{}", step.repeat(200));
    let Some((events, took)) = run("paths", &body) else {
        return;
    };
    assert!(largest(&events) <= expr::MAX_NODES);
    assert!(took.as_secs() < 10, "{took:?}");
}
